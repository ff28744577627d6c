"""Reading a policy file or mapping into a ``Document`` (data, origin, the position of every
key and value): safe YAML (no tags, duplicate keys refused, depth and size bounded before
libyaml sees the text), JSON, TOML, only regular files; ``extends`` chains (bounded) and
``--set`` / ``PROFILE_POLICY_SET`` overrides.

Imports from ``language.values`` only."""
