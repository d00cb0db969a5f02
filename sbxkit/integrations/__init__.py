"""Adapters that plug sbxkit sandboxes into agent frameworks, each behind its own extra."""
