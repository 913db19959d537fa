

def test_api_retries_last_about_ten_minutes_jittered_and_start_afresh_for_each_request():
    from strata_operator.decisions.backoff import API_RETRY_TOTAL_SECONDS, ApiRetryDelays

    low = list(ApiRetryDelays(uniform=lambda a, b: a))
    high = list(ApiRetryDelays(uniform=lambda a, b: b))
    assert low[:6] == [0.5, 1.0, 2.0, 4.0, 7.5, 15.0] and high[:2] == [1.5, 3.0]
    for delays in (low, high):
        assert API_RETRY_TOTAL_SECONDS <= sum(delays) < API_RETRY_TOTAL_SECONDS + 45  # far past Kopf's 54 s
    delays = ApiRetryDelays()
    first, second = list(delays), list(delays)
    assert len(first) > 8 and len(second) > 8 and first != second  # jittered, and not used up by the first
