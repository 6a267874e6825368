# S5-Retrieval at laptop scale (CPU): the paper's T²MLR model shrunk. Compared with the same transformer
# without recurrence (s5_tiny_transformer.py) and a parameter-matched LSTM (s5_tiny_lstm.py) by
#      python -m studies.s5_retrieval --compare
# 4 layers put the transformer's depth bound at 2^4 = 16 actions: between the longest training length
# (12) and the longest test length (24).

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
jacobi_sweeps = 16             # D: Jacobi sweeps per step, the final one included (positions < D exact)
jacobi_grad_sweeps = 4         # b: sweeps before the final one that keep gradient (b + 1 with autograd)
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
out_dir = "out/s5/s5_tiny_t2mlr"
