"""Subcommands of the ``firstpass`` CLI, one module each (see ``firstpass.cli``)."""
