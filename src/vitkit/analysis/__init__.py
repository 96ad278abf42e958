"""Analysis and figures: learning curves, confusion matrices, and the paper's Figure 6/7
analyses (attention rollout, mean attention distance, position-embedding similarity,
principal components of the pixel filters) behind `vitkit explain`."""
