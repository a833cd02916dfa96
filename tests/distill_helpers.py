"""The tiny distill config the distill and fault-injection tests share."""

TINY_DISTILL = [
    "models=tiny_random",
    "distill.student.init_layers=[0,2]",
    "distill.student.head_vocab=64",
    "distill.student.embed_rank=16",
    "distill.corpus.seq_len=32",
    "distill.corpus.shard_sequences=8",
    "distill.corpus.max_tokens=1024",
    "distill.eval_sequences=4",
    "distill.eval_every_shards=2",
    "distill.teacher.top_k=8",
    "distill.optim.batch_sequences=4",
]
