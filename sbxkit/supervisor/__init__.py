"""The independent supervisor process and its client (design.md §4)."""
