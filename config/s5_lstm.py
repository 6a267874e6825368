# S5-Retrieval baseline at the paper's settings: an LSTM (nn.LSTM, tied embeddings), T²MLR's schedule.
# Run: python -m studies.s5_retrieval config/s5_lstm.py

# model: 4 LSTM layers of width 682 = 15,034,008 parameters, within 0.1% of config/s5_t2mlr.py's 15,043,202
# (s5_retrieval.lstm_hidden_for). The T²MLR code's sweep used width 360 (4.23M parameters, not matched).
# The transformer keys below only give the vocabulary.
arch = "lstm"
lstm_layers = 4
lstm_hidden = 682
flavour = "llama"
vocab_size = 188               # the S5 tokenizer
block_size = 512               # the longest test example, n = 48: 10·48 + 1 = 481 tokens
n_layer = 6
n_embd = 384
n_head = 6
n_kv_head = 6
mlp_hidden = 1536
tie_embeddings = False
rope_pct = 0.0                 # NoPE: no positional encoding (the T²MLR code's DISABLE_POSITIONAL_ENCODING)

# task
train_min_n = 1
train_max_n = 32
test_min_n = 1
test_max_n = 48
value_len = 4
eval_examples = 256

# optimisation: batch 16, lr 5e-4, β2 0.95, wd 0.01, 5% warmup, cosine to 1% of the peak, 400k steps
batch_size = 16
max_iters = 400_000
learning_rate = 5e-4
min_lr = 5e-6
warmup_iters = 20_000
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 10_000
log_interval = 100
seed = 1337
dtype = "auto"                 # bf16 on CUDA
out_dir = "out/s5_lstm"
