"""The ``hyperpod`` admin commands: a thin client of the controller API."""
