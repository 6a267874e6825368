# Tiny LLaMA-flavour vanilla model: the T²MLR baseline at CPU scale
# (the tiny shape in which we timed the T²MLR code on CPU; see bench.py).
# Run: python prepare_data.py --source pydoc --tokenizer byte && python train.py config/tiny_llama.py

# model
flavour = "llama"              # the T²MLR paper's: RMSNorm, sequential residual, SwiGLU, full rotary, tied
vocab_size = 320               # byte tokenizer: 256 bytes + EOT = 257, padded up to a multiple of 64
block_size = 256               # context length
n_layer = 8
n_embd = 128
n_head = 4                     # head dim 32
n_kv_head = 4                  # no grouping at this size
mlp_hidden = 512               # SwiGLU width
rope_theta = 10000.0

# data
dataset = "pydoc"              # the Python reference manual that ships with CPython: no download needed

# optimisation: 4 sequences x 256 tokens x 4 micro-steps per step (as the other tiny configs)
total_batch_size = 4096
batch_size = 4
max_iters = 300
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 30
weight_decay = 0.1
grad_clip = 1.0

# evaluation, logging, system
eval_interval = 100
eval_iters = 8
log_interval = 20
device = "cpu"
compile = False
out_dir = "out/tiny_llama"
