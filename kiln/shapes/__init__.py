"""Symbolic sizes: the size symbols of one trace (``env``), the node torch's SymInt
wraps (``node``), the readable guards on them (``printing``), the user's marks
(``marks``) and which dims a compiled function traces symbolic (``policy``)."""
