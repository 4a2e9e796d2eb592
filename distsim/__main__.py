"""``python -m distsim`` runs the CLI."""
from .cli import entry

entry()
