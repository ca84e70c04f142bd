# The image the Kubernetes manifests run (scripts/k8s_*.yaml, `tfrecipe k8s --image ...`): this
# checkout installed, not a PyPI package (tfrecipe is not on PyPI). Build and push it where the
# cluster pulls from:
#
#   docker build -t REGISTRY/tfrecipe:latest . && docker push REGISTRY/tfrecipe:latest
#
# Extras: add `[export]`, `[tracking]` or `[sweepers]` to the install line as the config needs;
# on NVIDIA GPUs start from a CUDA base and install "tensorflow[and-cuda]>=2.21,<2.22" too.
FROM python:3.11-slim
WORKDIR /opt/tfrecipe
COPY pyproject.toml README.md ./
COPY tfrecipe ./tfrecipe
COPY conf ./conf
COPY recipes ./recipes
RUN pip install --no-cache-dir .
WORKDIR /work
# The manifests give the command (python -m tfrecipe) and its arguments.
CMD ["python", "-m", "tfrecipe", "--help"]
