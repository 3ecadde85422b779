"""Static word vectors: word2vec and GloVe training (:mod:`.word2vec`, :mod:`.glove`, run by
:mod:`.train`, their loops compiled in :mod:`.compiled`), the file formats (:mod:`.keyed`),
intrinsic evaluation (:mod:`.evaluate`) and the alignment of two spaces (:mod:`.align`);
docs/vectors.md is the guide."""
