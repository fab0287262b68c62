"""A third device family and a third kubelet API, defined outside agents/: what adding
one takes (docs/architecture.md, "Adding a family" and "Adding an API")."""
