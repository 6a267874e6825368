# S5-Retrieval, the T²MLR paper's settings (§3.1; the T²MLR code's train_s5_retrieval.sh): a GPU run.
# Run: python -m studies.s5_retrieval config/s5_t2mlr.py   (baselines: config/s5_transformer.py, config/s5_lstm.py)

# model: a 6-layer LLaMA-style transformer, H 384, no positional encoding, layers 1..4 recurrent in time
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
t2mlr = True
l_start = 1                    # the gate mixes R_{t-1} into the input of layer 1
l_end = 4                      # R_t is written from the output of layer 4
jacobi_sweeps = 16             # D: Jacobi sweeps per step, the final one included (positions < D exact)
jacobi_grad_sweeps = 4         # b: sweeps before the final one that keep gradient (b + 1 with autograd)
recurrent_residual = True          # R_t = s·(h_t + R_{t-1})
recurrent_detach = True            # no gradient along the R chain (the S5 scripts)
gate_bias_prob = 0.5           # gate biases logit(0.5) = 0
gate_weight_gain = 1.0

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
out_dir = "out/s5_t2mlr"
