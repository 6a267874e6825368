# S5-Retrieval with what made S5 learnable in the word problem (studies/word_problem.md): a length curriculum,
# larger batches and more examples. An overlay, given after one of the paper's configs (a GPU run):
#   python -m studies.s5_retrieval config/s5_t2mlr.py config/s5_curriculum.py --out_dir=out/s5_t2mlr_curriculum
#   (and config/s5_transformer.py, config/s5_lstm.py with their own out_dir: the same batches and steps)
# The model, the task's lengths and the training mode stay the paper's (config/s5_t2mlr.py).

# the curriculum over the number of actions: n from 1 (the first state is a copy of the first action), one
# more once the loss of the state tokens alone falls below the word problem's 0.3, every example at the
# curriculum's length. On the laptop (studies/s5_retrieval.md) this rule took T2MLR through n = 12; the rule on the whole
# loss never passed n = 2, where a lookup learned or not hid the state's loss.
curriculum_start = 1
curriculum_threshold = 0.3
curriculum_loss = "states"
curriculum_draw = "at_length"

# batch 256 (the word problem: with 32 words a step the curriculum stalled at three elements; 256 learned
# A5 and S5), 25,000 steps: the paper's 6.4M examples (400,000 steps of 16); lr 1e-3, between the paper's
# 5e-4 at batch 16 and the word problem's 3e-3 for far smaller models (DeltaProduct: 1e-3 at batch 2048);
# 5% warmup, then the peak held (min_lr = learning_rate), as in the laptop run
batch_size = 256
max_iters = 25_000
learning_rate = 1e-3
min_lr = 1e-3
warmup_iters = 1_250
eval_interval = 1_000
log_interval = 50
