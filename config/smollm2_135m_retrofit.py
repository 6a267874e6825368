# Retrofit T²MLR onto the released SmolLM2-135M (the T²MLR paper's §3.4 does this to SmolLM2-1.7B-Instruct).
# The architecture and weights come from the checkpoint (GPT.from_pretrained); the keys below add the
# recurrence over the middle 20% of its 30 layers and fine-tune. The gate starts as an exact identity
# (θ_r = θ_x = 0), so at step 0 the model is the released one: its first val loss is SmolLM2-135M's own.
#
#   python prepare_data.py --tokenizer hf:HuggingFaceTB/SmolLM2-135M --name fineweb_edu_smollm2  # own tokens
#   python train.py config/smollm2_135m_retrofit.py
# Offline, with the model downloaded to a folder (config.json, model.safetensors, tokenizer.json, ...):
#   python prepare_data.py --tokenizer hf:path/to/SmolLM2-135M --name fineweb_edu_smollm2
#   python train.py config/smollm2_135m_retrofit.py --init_from=hf:path/to/SmolLM2-135M

init_from = "hf:HuggingFaceTB/SmolLM2-135M"

# the recurrence (paper §2-3): layer 17's output at token t-1 is gated into layer 12's input at token t
t2mlr = True
l_start = 12
l_end = 17
jacobi_sweeps = 16             # D: Jacobi sweeps per step, the final one included (positions < D exact)
jacobi_grad_sweeps = 4         # b: sweeps before the final one that keep gradient (b + 1 with autograd)
recurrent_residual = True
recurrent_detach = False
gate_weight_gain = 0.01         # small gate weights, as the T²MLR code fine-tunes pretrained models
block_size = 2048               # the checkpoint allows 8192; 2048 as in the paper's pretraining runs

# data and optimisation: a short fine-tune, far below the pretraining learning rate
dataset = "fineweb_edu_smollm2"
total_batch_size = 131_072      # 64 sequences x 2048 tokens
batch_size = 8
max_iters = 2_000               # 262M tokens
learning_rate = 1e-4
min_lr = 1e-5
warmup_iters = 100
lr_decay_iters = 2_000
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.98
grad_clip = 1.0
eval_interval = 250
eval_iters = 50
out_dir = "out/smollm2_135m_retrofit"
