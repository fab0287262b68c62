"""DRA mode (SPEC section 10): every family served as a DRA driver."""
