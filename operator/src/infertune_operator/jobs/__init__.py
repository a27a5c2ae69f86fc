"""What runs inside the Jobs the operator creates: `infertune tune-job` in the tuner Job
(``tune_job``) and `infertune verify-job` in the verification Job (``verify_job``).
"""
