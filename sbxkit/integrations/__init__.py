"""Adapters that let agent frameworks run their sandboxes on sbxkit (docs/integrations.md)."""
