"""The Kubernetes boundary: the only code that imports the ``kubernetes`` client (``client``),
what a failed call means (``errors``), the resources the operator reads and writes
(``resources``) and the hand-over of old fields to server-side apply (``managed_fields``).
"""
