"""The independent supervisor process and its client (docs/architecture.md, "The owner seam";
docs/operations.md)."""
