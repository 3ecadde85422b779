"""Static word vectors: the representations BERT replaced and is still compared against.

- :mod:`lmlab.vectors.sentences`: a corpus (lmlab corpus folder or text files) streamed as
  sentences of words, and its vocabulary;
- :mod:`lmlab.vectors.word2vec`: skip-gram and CBOW with negative sampling (Mikolov et al. 2013);
- :mod:`lmlab.vectors.cooccurrence` and :mod:`lmlab.vectors.glove`: distance-weighted
  co-occurrence counts and GloVe's weighted least squares with AdaGrad (Pennington et al. 2014);
- :mod:`lmlab.vectors.keyed`: a table of word vectors, read and written in the word2vec text
  and binary formats and GloVe's text format, and the Stanford GloVe 6B 50-d vectors;
- :mod:`lmlab.vectors.evaluate`: word similarity (WordSim-353, SimLex-999; Spearman) and the
  analogy questions (3CosAdd, 3CosMul; accuracy per section), out-of-vocabulary counts reported;
- :mod:`lmlab.vectors.align`: mapping one space onto another (orthogonal Procrustes from a seed
  dictionary) and retrieving translations (nearest neighbour or CSLS).
"""
