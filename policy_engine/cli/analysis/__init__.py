"""What ``policy-engine analyze`` and the report's analysis section share: capture windows
from the manifests (``windows``), one trace summed up per worker (``trace_stats``, over
``intervals``), one window compared across its ranks (``compare``), the whole run
(``run``), text (``text``) and Holistic Trace Analysis beside it (``hta``)."""
