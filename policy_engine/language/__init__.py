"""The policy language: text -> document with positions -> problems -> frozen Policy.

Nothing here imports torch. Its sub-packages, each importing only those before it:

- ``values/``: the language's value types, no policy in sight: step sets and their run
  arithmetic, rank selectors, meshes, sizes, schedules, name templates, triggers and
  limits, frozen containers.
- ``read/``: a file or a mapping into a :class:`~policy_engine.language.read.document.Document`
  with the position of every key and value: safe YAML, JSON, TOML, ``extends`` chains,
  ``--set`` overrides.
- ``schema/``: the schema (base keys + each backend's settings), its defaults and the
  validator of the JSON-Schema subset it uses.
- ``model.py``: the frozen ``Policy`` and ``RoleSpec`` built from what the schema accepted.
- ``rules/``: cross-field rules on the built roles (meshes against the world, unique
  names, colocation, what an engine role may ask).
- ``load.py``: ``load_policy``, the one pipeline the library and the CLI share.
"""
