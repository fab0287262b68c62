"""DRA mode (docs/dra.md): every family served as a DRA driver."""
