# S5-Retrieval with what made S5 learnable in the word problem (docs/word_problem.md): a length curriculum,
# larger batches and more examples. An overlay, given after one of the paper's configs (a GPU run):
#   python -m studies.s5_retrieval config/s5_t2mlr.py config/s5_curriculum.py --out_dir=out/s5_t2mlr_curriculum
#   (and config/s5_transformer.py, config/s5_lstm.py with their own out_dir: the same batches and steps)
# The model, the task's lengths and the training mode stay the paper's (config/s5_t2mlr.py).

# the curriculum over the number of actions: n from 1 (the first state is a copy of the first action), one
# more once the training loss falls below the threshold. The loss here is a mean over all ten tokens of an
# action and the copied prompt, so 0.05 asks for about the word problem's 0.3 on the state tokens alone.
curriculum_start = 1
curriculum_threshold = 0.05

# batch 256 (the word problem: with 32 words a step the curriculum stalled at three elements; 256 learned
# A5 and S5), 25,000 steps: the paper's 6.4M examples (400,000 steps of 16); lr 1e-3, between the paper's
# 5e-4 at batch 16 and the word problem's 3e-3 for far smaller models (DeltaProduct: 1e-3 at batch 2048);
# 5% warmup, cosine to 1%
batch_size = 256
max_iters = 25_000
learning_rate = 1e-3
min_lr = 1e-5
warmup_iters = 1_250
eval_interval = 1_000
log_interval = 50
