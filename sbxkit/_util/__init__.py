"""Small tools every layer may use: no sbxkit imports but ``sbxkit.errors``."""
