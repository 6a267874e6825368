# S5-Retrieval at laptop scale (CPU), baseline: a parameter-matched LSTM.
# One of the three models of `python -m studies.s5_retrieval --compare` (+ s5_tiny_t2mlr.py, s5_tiny_transformer.py).
# 4 layers put the transformer's depth bound at 2^4 = 16 actions: between the longest training length
# (12) and the longest test length (24).

# model: an LSTM (nn.LSTM, tied embeddings), 4 layers, width 189 = 1,184,652 parameters, within 0.4% of
# s5_tiny_t2mlr.py's 1,180,034 (s5_retrieval.lstm_hidden_for). The transformer keys below: vocabulary only.
arch = "lstm"
lstm_layers = 4
lstm_hidden = 189
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
out_dir = "out/s5/s5_tiny_lstm"
