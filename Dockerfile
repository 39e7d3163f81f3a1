# syntax=docker/dockerfile:1
# Multi-stage: build a wheel with its dependencies, then a slim runtime as non-root.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY clients clients
COPY service service
COPY trainer_plugins trainer_plugins
COPY migrations migrations
COPY benchmarks benchmarks
RUN pip install --no-cache-dir --upgrade pip \
 && pip wheel --no-cache-dir --wheel-dir /wheels '.[server]'

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 rollplan
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER rollplan
WORKDIR /home/rollplan
ENV ROLLPLAN_DATABASE_URL=sqlite:////home/rollplan/rollplan.db
EXPOSE 8321
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8321/readyz').status != 200)"
CMD ["rollplan", "serve", "--host", "0.0.0.0", "--port", "8321"]
