# Tiny T²MLR: tiny_llama.py with layers 2..5 recurrent in time
# (the tiny setting in which we timed the T²MLR code on CPU; see bench.py).
# Run: python prepare_data.py --source pydoc --tokenizer byte && python train.py config/tiny_t2mlr.py
# Retrofit a trained tiny_llama instead of training from scratch:
#      python train.py config/tiny_t2mlr.py --init_from=out/tiny_llama/ckpt.pt

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
t2mlr = True                   # temporal middle-layer recurrence
l_start = 2                    # the gate mixes R_{t-1} into the input of layer 2
l_end = 5                      # R_t is written from the output of layer 5
jacobi_sweeps = 16             # D: Jacobi sweeps per step, the final one included (positions < D exact)
jacobi_grad_sweeps = 4         # b: sweeps before the final one that keep gradient (b + 1 with autograd)
val_mode = "exact"             # validation with the exact token-by-token recurrence

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
out_dir = "out/tiny_t2mlr"
