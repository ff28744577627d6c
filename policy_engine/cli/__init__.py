"""The ``policy-engine`` command line. It never imports torch."""
