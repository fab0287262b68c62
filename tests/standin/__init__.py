"""Stand-ins used only by tests and hack/."""
