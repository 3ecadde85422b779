"""The main job: ``lmlab demo`` (what ``make demo`` runs).

It reproduces the course's central claim on one CPU: pretraining a Transformer on unlabelled
text makes it better at downstream tasks. Corpus -> tokenizer -> shards -> MLM pretraining ->
fine-tuning (pretrained vs random vs TF-IDF) -> contextual neighbours and fill-mask -> report.
See :func:`lmlab.demo.job.run_demo`.
"""
