"""Op families, one module each (``conv``, ``pool``, ``norm``, ``eltwise``, ``binary``, ``gemm``,
``softmax``, ``reduce``, ``copy``, ``rnn``, ``resample``, ``attention``, ``generic``), over the key
grammar (``grammar``) and the records they share (``base``); ``registry`` is the table of them
all. docs/contributing.md says how to add one.

This package's own import stays empty: ``benanza.layers`` builds on ``grammar``, and the
registry builds on ``benanza.layers``.
"""
