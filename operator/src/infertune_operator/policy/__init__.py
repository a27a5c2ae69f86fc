"""The operator's decisions (pure: observed objects in, the next step out): what a spec needs
tuned (``tuning``) and how serving it goes (``serving``), the status conditions they set,
what a tuner Job says, the verification after rollout, drift and retunes, measurement noise,
and when to retry the API.
"""
