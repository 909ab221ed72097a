"""What fedbug connects to, each optional: Flower (simulation and deployment), Ray clusters,
MLflow and TensorBoard trackers. Only this package imports flwr and ray."""
