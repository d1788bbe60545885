//! The client-side rate limit upstream's clients apply to every request: a token bucket of
//! `kubeAPIBurst` tokens refilled at `kubeAPIQPS` per second. A node agent that loops on an
//! error must never flood the API server, whatever the bug.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service};

use crate::base::clock;

/// A token bucket shared by every clone of the client.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Arc<Mutex<BucketState>>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// `qps` below zero means no limit; zero takes client-go's defaults (5 per second, burst
    /// 10), as upstream does for an unset value. The bucket starts full.
    pub(crate) fn new(qps: f32, burst: u32) -> TokenBucket {
        let (qps, burst) = match (qps, burst) {
            (q, _) if q < 0.0 => (f64::INFINITY, f64::INFINITY),
            (0.0, b) => (5.0, if b == 0 { 10.0 } else { b as f64 }),
            (q, b) => (q as f64, (b.max(1)) as f64),
        };
        TokenBucket {
            qps,
            burst,
            state: Arc::new(Mutex::new(BucketState {
                tokens: burst,
                refilled_at: clock::instant(),
            })),
        }
    }

    /// Takes one token and says how long the caller must wait before using it (zero when one
    /// was there). Waiting callers queue up in order because each one's debt is booked here.
    pub(crate) fn reserve(&self) -> Duration {
        if self.qps.is_infinite() {
            return Duration::ZERO;
        }
        let now = clock::instant();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(s.refilled_at).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.qps).min(self.burst);
        s.refilled_at = now;
        s.tokens -= 1.0;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.tokens / self.qps)
        }
    }
}

/// A tower layer that makes each request wait for a token of the bucket.
#[derive(Clone, Debug)]
pub(crate) struct RateLimitLayer {
    bucket: TokenBucket,
}

impl RateLimitLayer {
    pub(crate) fn new(bucket: TokenBucket) -> Self {
        RateLimitLayer { bucket }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            permit: Permit::None,
        }
    }
}

/// The service [`RateLimitLayer`] makes. The token is taken in `poll_ready`, so a caller
/// that is told "ready" may send at once (the client puts a buffer in front of it).
pub(crate) struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    permit: Permit,
}

enum Permit {
    None,
    Waiting(Pin<Box<tokio::time::Sleep>>),
    Held,
}

impl<S, Req> Service<Req> for RateLimited<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.permit {
                Permit::None => {
                    let wait = self.bucket.reserve();
                    self.permit = if wait.is_zero() {
                        Permit::Held
                    } else {
                        Permit::Waiting(Box::pin(tokio::time::sleep(wait)))
                    };
                }
                Permit::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.permit = Permit::Held;
                }
                Permit::Held => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.permit = Permit::None;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let bucket = TokenBucket::new(10.0, 3);
        let waits: Vec<Duration> = (0..5).map(|_| bucket.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200));
        // After a second the bucket holds what a second refills (capped at the burst).
        tokio::time::advance(Duration::from_secs(2)).await;
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn negative_qps_is_unlimited_and_zero_takes_client_go_defaults() {
        let free = TokenBucket::new(-1.0, 0);
        assert!((0..1000).all(|_| free.reserve().is_zero()));
        let default = TokenBucket::new(0.0, 0);
        assert!((0..10).all(|_| default.reserve().is_zero()));
        assert_eq!(default.reserve(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_delays_requests_beyond_the_burst() {
        let svc = tower::service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n) });
        let mut limited = RateLimitLayer::new(TokenBucket::new(2.0, 1)).layer(svc);
        let start = Instant::now();
        for n in 0..3 {
            use tower::ServiceExt;
            assert_eq!(limited.ready().await.unwrap().call(n).await.unwrap(), n);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
