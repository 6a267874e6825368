# S5-Retrieval at laptop scale (CPU), T²MLR trained on exact states: s5_tiny_t2mlr.py with train_mode="exact"
# (the recurrence token by token with autograd). With Jacobi sweeps (D = 16) only the first 16 positions of a
# training sequence see their exact state, about 3 of the 5-token actions; a state tracker is not
# contractive, so the later positions would train on wrong states. Exact training is also the cheaper on a
# CPU here (0.42 s against 0.88 s a step, one thread): the middle layers run once per token, not D times.
#      python -m studies.s5_retrieval config/s5_tiny_t2mlr_exact.py
# The rerun of setting A with it, its initialisation and gate-LR arms: python -m studies.s5_retrieval --rerun

# model: LLaMA-style, no positional encoding, layers 1..2 recurrent in time (the paper: 1..4 of 6)
flavour = "llama"
vocab_size = 188               # the S5 tokenizer
block_size = 256               # the longest test example, n = 24: 10·24 + 1 = 241 tokens
n_layer = 4
n_embd = 128
n_head = 4
n_kv_head = 4
mlp_hidden = 512
tie_embeddings = False
rope_pct = 0.0                 # NoPE, as the paper's S5 models
t2mlr = True
l_start = 1
l_end = 2
jacobi_sweeps = 16             # D, b: unused in training here (train_mode exact); kept as s5_tiny_t2mlr.py
jacobi_grad_sweeps = 4
recurrent_residual = True
recurrent_detach = True
gate_bias_prob = 0.5
gate_weight_gain = 1.0

# task
train_min_n = 1
train_max_n = 12
test_min_n = 1
test_max_n = 24
value_len = 4
eval_examples = 64

train_mode = "exact"           # token by token with autograd: every position trains on its exact state

# optimisation: the paper's recipe (β2 0.95, wd 0.01, 5% warmup, cosine to 1%) at a laptop's step count
batch_size = 16
max_iters = 2000
learning_rate = 1e-3
min_lr = 1e-5
warmup_iters = 100
weight_decay = 0.01
beta2 = 0.95
grad_clip = 1.0
eval_interval = 250
log_interval = 25
seed = 1337
device = "cpu"
out_dir = "out/s5/s5_tiny_t2mlr_exact"
