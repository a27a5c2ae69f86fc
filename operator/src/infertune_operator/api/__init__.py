"""The InferenceDeployment API (infertune.io/v1alpha1): its types (``types``, the single source of
truth; the CRD in ``crds/`` is generated from them by ``crd``), manifests read and validated
(``manifest``), what a valid spec cannot tune (``feasibility``) or will likely trip over
(``advisories``), and its translation into the tuner's request (``to_request``).
"""
