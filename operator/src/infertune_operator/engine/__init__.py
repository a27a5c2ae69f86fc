"""The operator's Kopf engine: the only code that imports ``kopf`` (``handlers``), the reconcile
loop (``controller``) and what its syncs share (``context``), the writes of a sync (status,
created Jobs), the verification and retune inside a sync, and the observer of the serving pods.
"""
