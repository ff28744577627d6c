"""The policy schema: the base role keys (``base.py``), each backend's settings from the
``settings`` registry, assembled with their defaults (``build.py``), and the validator of
the JSON-Schema subset it uses, with located messages (``validator.py``).

Imports from ``language.values`` and ``language.read``."""
