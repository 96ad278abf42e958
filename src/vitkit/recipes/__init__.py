"""Training recipes shipped with vitkit (JSON)."""
