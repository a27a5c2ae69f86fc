"""What the serving pods see (pure apart from ``prometheus``'s HTTP query): their metrics text
parsed (``metrics_text``), the same figures from a Prometheus server (``prometheus``), and the
rolling window of the live workload (``window``).
"""
