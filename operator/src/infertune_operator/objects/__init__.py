"""The Kubernetes objects the operator creates, as plain dicts (pure): the serving ConfigMap,
Deployment and Service (``serving``), the tuner Job and what it needs (``tuner_job``, with its
parallel workers and its deadline), and the pod pieces both share (``pods``).
"""
