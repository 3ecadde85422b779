"""The main job, ``lmlab demo`` (``make demo``): does pretraining a Transformer on unlabelled
text make it better at downstream tasks? :func:`lmlab.demo.job.run_demo`; docs/demo.md.
"""
