"""The HTML pages render the stored data, escaped."""

from __future__ import annotations

import ast
import html
import re

from fastapi.testclient import TestClient

from fuzzer.results import CaseResult
from oracle.config import AttentionCase
from service.db.store import SqlStore
from tests.service.conftest import Seeded


def _page(client: TestClient, path: str, **params: object) -> str:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def test_overview_shows_counts_per_backend_buckets_and_workers(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, "/")
    assert "3 cases, 7 results" in page
    assert "3 buckets, 1 live workers" in page
    for text in ("fa2", "fa4", "sdpa", "te", "unsupported", "gpu-host-1", "cuda:0", "out:nan", "lse:mismatch"):
        assert text in page, text
    assert f'href="/buckets/{seeded.nan_bucket_id}"' in page


def test_overview_renders_an_empty_database(client: TestClient) -> None:
    page = _page(client, "/")
    assert "0 cases, 0 results" in page
    assert "no live workers" in page


def test_buckets_page_lists_and_filters(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, "/buckets")
    assert "3 buckets" in page
    for bucket_id in (seeded.nan_bucket_id, seeded.crash_bucket_id, seeded.fa4_bucket_id):
        assert f'href="/buckets/{bucket_id}"' in page
    filtered = _page(client, "/buckets", backend="fa2")
    assert "1 buckets" in filtered
    assert "<code>crash</code>" in filtered
    assert "out:nan" not in filtered


def test_buckets_page_links_to_the_next_page(client: TestClient, seeded: Seeded) -> None:
    first = _page(client, "/buckets", sort="id", limit=2)
    assert 'rel="next"' in first and "offset=2" in first
    assert 'rel="prev"' not in first
    last = _page(client, "/buckets", sort="id", limit=2, offset=2)
    assert 'rel="prev"' in last and 'rel="next"' not in last


def test_bucket_page_shows_the_minimised_case_metrics_and_results(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, f"/buckets/{seeded.nan_bucket_id}")
    assert html.escape(seeded.minimised_case.describe()) in page
    assert html.escape(seeded.case.describe()) in page
    assert "&#34;causal_alignment&#34;: &#34;bottom_right&#34;" in page, "the minimised case's JSON"
    assert "shrunk in 41 steps" in page
    for column in ("err_backend", "err_baseline", "error_ratio"):
        assert f"<th>{column}</th>" in page
    assert "<th>lse</th>" in page and "0.31" in page
    assert f'href="/cases/{seeded.other_case.case_id}"' in page
    assert "3 of 3" in page


def test_case_page_shows_json_description_and_all_results(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, f"/cases/{seeded.case.case_id}")
    assert html.escape(seeded.case.describe()) in page
    assert "&#34;seqlen_k&#34;: 799" in page
    assert "SIGSEGV in flash_fwd" in page
    assert 'class="status-crash"' in page and 'class="status-pass"' in page
    assert f'href="/buckets/{seeded.crash_bucket_id}"' in page


def test_pages_of_unknown_ids_are_404(client: TestClient) -> None:
    assert client.get("/buckets/987654").status_code == 404
    response = client.get("/cases/0123456789abcdef")
    assert response.status_code == 404
    assert "There is no case 0123456789abcdef" in response.text


def test_stored_text_is_escaped(client: TestClient, store: SqlStore, seeded: Seeded) -> None:
    hostile = "<script>alert(1)</script>"
    result = CaseResult(
        case_id=seeded.case.case_id,
        backend="sdpa",
        variant="default",
        status="error",
        signature=f"error:{hostile}",
        detail=hostile,
        phase="replay",
    )
    update = store.record_result(result, seeded.build_id, None)
    for path in (f"/buckets/{update.bucket_id}", f"/cases/{seeded.case.case_id}", "/buckets", "/"):
        page = _page(client, path)
        assert hostile not in page, path
        assert html.escape(hostile, quote=False) in page, path


def test_the_filter_form_with_every_field_left_at_any_lists_everything(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, "/buckets", backend="", variant="", signature="", triage_state="", sort="-last_seen", limit=50)
    assert "3 buckets" in page


# ------------------------------------------------------------------------- dashboard pages
def test_overview_embeds_the_hourly_chart_data_and_failure_bars(client: TestClient, seeded: Seeded) -> None:
    import json
    import re

    page = _page(client, "/")
    data = json.loads(re.search(r'<script type="application/json" id="hourly-data">(.*?)</script>', page, re.S).group(1))
    assert len(data["hours"]) == 24 and sum(data["results"]) == 7
    assert '<script src="/static/uPlot-1.6.32.iife.min.js"></script>' in page
    assert "Failures per backend" in page and "Failures per signature" in page
    assert 'title="out:nan"' in page
    assert "cases/s" in page and "last heartbeat" in page


def test_static_assets_are_served_locally(client: TestClient) -> None:
    for path in ("/static/uPlot-1.6.32.iife.min.js", "/static/dashboard.js", "/static/dashboard.css"):
        response = client.get(path)
        assert response.status_code == 200 and len(response.content) > 500, path
    assert "uPlot" in client.get("/static/uPlot-1.6.32.iife.min.js").text


def test_buckets_page_offers_every_filter_and_shows_builds_and_notes(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, "/buckets")
    for name in ("backend", "variant", "signature", "triage_state", "dtype", "head_dim", "mask", "build_id", "sort"):
        assert f'name="{name}"' in page, name
    assert "(build 1)" in page or f"(build {seeded.build_id})" in page
    filtered = _page(client, "/buckets", dtype="float16", mask="window")
    assert "2 buckets" in filtered and "<code>crash</code>" not in filtered
    assert client.get("/buckets", params={"mask": "diagonal"}).status_code == 422


def test_bucket_page_has_the_triage_form_repro_link_and_error_map(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, f"/buckets/{seeded.nan_bucket_id}")
    assert f'action="/buckets/{seeded.nan_bucket_id}/triage"' in page
    for state in ("new", "confirmed", "reported", "fixed", "wontfix", "duplicate"):
        assert f'<option value="{state}"' in page
    assert "no repro export for backend sdpa" in page, "sdpa/default has no snippet"
    assert 'class="heatmap" data-tensor="out"' in page
    assert 'class="worst"' in page, "worst_index [0, 3, 0, 17] lands in a tile"
    assert '<th colspan="2">mask</th>' in page and "<code>causal_alignment</code>" in page, "the case in readable form"


def test_a_plugin_bucket_page_says_the_service_could_not_import_it_and_how_to_export_it(
    client: TestClient, store: SqlStore, seeded: Seeded
) -> None:
    """A new-user trial: the bucket of a plugin (``fuzz --backend localk:LocalBackend``) said "its
    adapter defines no repro method", while the service only could not import the plugin (the
    database keeps no ``module:attr``). The page says so and gives the ``attnfuzz export`` command of
    the bucket's case and variant; a known backend without a repro method keeps the old words."""
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=1, head_dim=8, causal=True, dtype="float32")
    store.record_case(case.to_json(), "fuzz")
    plugin = store.record_result(CaseResult(case.case_id, "localmath", "bool_mask", "fail", signature="out:mismatch"),
                                 seeded.build_id, None)
    page = html.unescape(_page(client, f"/buckets/{plugin.bucket_id}"))
    said = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "no repro export for backend localmath here: the service could not import it" in said, said
    assert "a plugin that attnfuzz fuzz loaded as --backend module:attr" in said
    assert f"attnfuzz export {case.case_id} --backend MODULE:ATTR --variant bool_mask --db DATABASE_URL" in said
    assert "its adapter defines no repro method" not in said and 'id="download-repro"' not in page
    no_repro = store.record_result(CaseResult(case.case_id, "torch-flex", "mask_mod", "fail", signature="out:mismatch"),
                                   seeded.build_id, None)
    page = _page(client, f"/buckets/{no_repro.bucket_id}")
    assert "no repro export for backend torch-flex (its adapter defines no repro method)" in page
    assert "could not import" not in page


def _stored_allowances(case: AttentionCase) -> dict:
    """Metrics carrying the allowances a worker stores with a verdict (the repro endpoint uses
    stored figures only)."""
    from service.export.allowance import computed_allowance

    return {name: {"allowed_global": a.whole, "tile_allowed": a.tiles} for name, a in computed_allowance(case).items()}


def test_case_page_shows_results_by_build_and_backend_with_repro_links(client: TestClient, store: SqlStore, seeded: Seeded) -> None:
    store.record_result(
        CaseResult(case_id=seeded.case.case_id, backend="torch-cpu-math", variant="is_causal", status="fail",
                   signature="out:mismatch", metrics=_stored_allowances(seeded.case)),
        seeded.other_build_id, None,
    )
    page = _page(client, f"/cases/{seeded.case.case_id}")
    assert "On every build and backend" in page
    assert f"build {seeded.build_id}<br>" in page and f"build {seeded.other_build_id}<br>" in page
    assert f'href="/api/cases/{seeded.case.case_id}/repro.py?backend=torch-cpu-math&amp;variant=is_causal"' in page
    assert "repro.py?backend=sdpa" not in page, "sdpa has no export snippet"


def test_every_repro_link_of_a_case_page_answers_a_python_file(client: TestClient, store: SqlStore, seeded: Seeded) -> None:
    """A new-user trial: a passing or unsupported row linked ``repro.py``, whose endpoint answered
    422 JSON (it needs force=true) that the browser saved as repro.py. Only rows that export
    unforced are linked, and every link answers the file."""
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=16, causal=True, dtype="float32")
    store.record_case(case.to_json(), "fuzz")
    metrics = _stored_allowances(case)
    for variant, status in (("is_causal", "fail"), ("bool_mask", "pass"), ("float_mask", "unsupported")):
        signature = "out:mismatch" if status == "fail" else None
        store.record_result(CaseResult(case.case_id, "torch-cpu-math", variant, status, signature=signature,
                                       metrics=metrics), seeded.build_id, None)
    store.record_result(CaseResult(case.case_id, "torch-cpu-flash", "is_causal", "pass", metrics=metrics), seeded.build_id, None)
    page = _page(client, f"/cases/{case.case_id}")
    links = [html.unescape(href) for href in re.findall(r'<a class="repro-link" href="([^"]+)"', page)]
    assert [link.split("?", 1)[1] for link in links] == ["backend=torch-cpu-math&variant=is_causal"], links
    for link in links:
        response = client.get(link)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/x-python")
        ast.parse(response.text)


def test_builds_page_lists_builds_and_links_the_matrix(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, "/builds")
    assert 'id="build-matrix"' in page and 'href="/matrix"' in page
    assert "NVIDIA H200" in page and f'href="/buckets?build_id={seeded.build_id}"' in page
    assert 'href="/builds"' in _page(client, "/"), "navigation entry"
    assert 'href="/matrix"' in _page(client, "/"), "navigation entry"


def test_small_masks_are_drawn(client: TestClient, seeded: Seeded) -> None:
    page = _page(client, f"/cases/{seeded.minimised_case.case_id}")
    assert '<pre class="maskpic">1 1 .\n1 1 1</pre>' in page
