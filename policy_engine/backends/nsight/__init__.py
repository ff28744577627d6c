"""Nsight Systems (``backend: nsight``, alias ``nsys``): ``checks`` for validate, ``launch``
for the nsys arguments, ``session`` for the capture ranges inside training."""
