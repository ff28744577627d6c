"""Cross-field rules on the built roles: each role's mesh (its own, else the top-level one)
against the world, unique capture names (proven on boxes of mesh coordinates), merge and
discrete captures, ``colocate``, and what a rollout role whose backend is an engine may ask
(a mesh read as an engine's replicas and ranks).

Imports from ``language.values``, ``language.read``, ``language.schema`` and ``model.py``."""
