"""Model variants: the variants file, sticky assignment, and the statistics that compare them."""
