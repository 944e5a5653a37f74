"""Example training jobs that use the SDK the way a real one should: everything that decides
the next step (weights, optimizer moments, LR schedule, data position, RNG) is in the
checkpoint, so a resumed run continues bit for bit. Run one under the runner:

    ckpt-ha run --job demo -- \
        python -m ckpt_ha.lab.examples.numpy_mlp --steps 200 --sleep-per-step 0.1
"""
