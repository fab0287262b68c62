"""Stand-ins that only the tests and hack/ use: they stay out of the installed package."""
