"""Analysis and figures: learning curves, confusion matrices (attention maps to come)."""
