# The service image: 'attnfuzz serve' (dashboard, JSON API) on PostgreSQL, CPU only (torch's CPU
# wheel: the service reads and replays stored cases, it runs no GPU kernel).
#
#   docker build -f deploy/docker/service.Dockerfile -t attnfuzz-service .
#   docker run -e ATTNFUZZ_DATABASE_URL=postgresql://... -e ATTNFUZZ_API_TOKEN=... -p 8000:8000 attnfuzz-service
#
# The schema is migrated at start ('attnfuzz db upgrade'; a no-op when current). tests/fleet/test_recipes.py
# parses this file (dockerfile-parse) and checks it.
FROM python:3.12-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN pip install --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple torch==2.11.0
COPY . /opt/attnfuzz-src
RUN pip install "/opt/attnfuzz-src[postgres]" && useradd --create-home --uid 1000 attnfuzz
USER attnfuzz
WORKDIR /home/attnfuzz
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/overview', timeout=4)"]
CMD ["sh", "-c", "attnfuzz db upgrade && exec attnfuzz serve --host 0.0.0.0 --port 8000"]
