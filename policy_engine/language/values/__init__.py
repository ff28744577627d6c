"""The language's value types: step sets (runs, never expanded), rank selectors, meshes,
byte sizes, ``torch.profiler.schedule`` as integer arithmetic, name templates, a role's
triggers and limits, frozen containers.

Imports nothing from the rest of the language."""
