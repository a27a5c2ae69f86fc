"""The tuning report on the cluster: its ConfigMap codec (``store``) and bounded summary
(``summary``), whose tuning may write it (``owner``), the guarded write (``writer``), and what
`infertune report` adds after deploy (``live``).
"""
