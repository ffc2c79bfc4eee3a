#define BOOST_TEST_MODULE tensor
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>

import ringkv;

namespace trace = ringkv::trace;
using ringkv::dtype;

namespace {
template <class E>
bool mentions(const E& e, const char* word) {
  return std::string(e.what()).find(word) != std::string::npos;
}
std::vector<std::size_t> bytes_of_allocations(const trace::recorder& r) {
  std::vector<std::size_t> v;
  for (const auto& a : r.of<trace::allocation>()) v.push_back(a.bytes);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(storage_is_64_byte_aligned_zeroed_and_traced_with_exact_bytes) {
  trace::recorder r(16);
  {
    ringkv::storage s(1000, "test-site", r);
    BOOST_TEST(reinterpret_cast<std::uintptr_t>(s.data()) % 64 == 0u);
    BOOST_TEST(s.bytes() == 1000u);
    for (std::byte b : s.as<std::byte>()) BOOST_REQUIRE(b == std::byte{0});
    BOOST_TEST(bytes_of_allocations(r) == (std::vector<std::size_t>{1000}),
               boost::test_tools::per_element());
    BOOST_TEST(ranges::distance(r.of<trace::release>()) == 0);
  }
  auto releases = r.of<trace::release>();
  BOOST_TEST(ranges::distance(releases) == 1);
  BOOST_TEST((*ranges::begin(releases)).bytes == 1000u);
  BOOST_TEST((*ranges::begin(releases)).site == "test-site");
}

BOOST_AUTO_TEST_CASE(storage_of_a_huge_page_or_more_starts_on_a_huge_page_boundary) {
  trace::recorder r(8);
  const std::size_t bytes = ringkv::storage::huge_page + 100;
  {
    ringkv::storage s(bytes, "test-huge", r);
    BOOST_TEST(reinterpret_cast<std::uintptr_t>(s.data()) % ringkv::storage::huge_page == 0u);
    BOOST_TEST(s.bytes() == bytes);
    std::size_t nonzero = 0;
    for (std::byte b : s.as<std::byte>()) nonzero += b != std::byte{0};
    BOOST_TEST(nonzero == 0u);
    s.data()[bytes - 1] = std::byte{1};  // the last byte is the caller's
  }
  BOOST_TEST(bytes_of_allocations(r) == std::vector<std::size_t>{bytes});
  BOOST_TEST(ranges::distance(r.of<trace::release>()) == 1);
  ringkv::storage small(ringkv::storage::huge_page - 64, "test-small");
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(small.data()) % ringkv::storage::alignment == 0u);
}

BOOST_AUTO_TEST_CASE(moving_storage_transfers_ownership_and_releases_once) {
  trace::recorder r(16);
  {
    ringkv::storage a(256, "a", r);
    std::byte* p = a.data();
    ringkv::storage b = std::move(a);
    BOOST_TEST(a.empty());
    BOOST_TEST(b.data() == p);
    ringkv::storage c(64, "c", r);
    c = std::move(b);  // c's old buffer is released now
    BOOST_TEST(ranges::distance(r.of<trace::release>()) == 1);
    BOOST_TEST(c.data() == p);
  }
  BOOST_TEST(ranges::distance(r.of<trace::release>()) == 2);
}

BOOST_AUTO_TEST_CASE(zero_sized_storage_is_refused) {
  BOOST_CHECK_EXCEPTION(ringkv::storage(0, "x"), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "bytes must be > 0"); });
}

BOOST_AUTO_TEST_CASE(a_views_strides_address_the_right_elements) {
  // A ring-like layout: 2 heads, each with room for 5 positions of 3 floats; the view covers
  // positions 1..3 of each head, so the head stride (15) is larger than 3 rows.
  std::vector<float> data(2 * 5 * 3);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  auto* base = reinterpret_cast<std::byte*>(data.data());
  ringkv::tensor_view full(base, dtype::f32, 2, 5, 3, 15, 3);
  auto v = full.slice(1, 3);
  BOOST_TEST(v.positions() == 3u);
  BOOST_TEST(v.head_stride() == 15u);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t p = 0; p < 3; ++p)
      for (std::size_t d = 0; d < 3; ++d)
        BOOST_TEST(v.row<float>(h, p)[d] == float(h * 15 + (p + 1) * 3 + d));
  BOOST_TEST(v.bytes() == 2u * 3u * 3u * 4u);
}

BOOST_AUTO_TEST_CASE(bad_view_shapes_are_refused_with_the_argument_named) {
  std::vector<float> data(64);
  auto* base = reinterpret_cast<std::byte*>(data.data());
  BOOST_CHECK_EXCEPTION(ringkv::tensor_view(base, dtype::f32, 0, 4, 4, 16, 4),
                        std::invalid_argument, [](const auto& e) { return mentions(e, "heads"); });
  BOOST_CHECK_EXCEPTION(ringkv::tensor_view(base, dtype::f32, 1, 4, 0, 16, 4),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, "head_dim"); });
  BOOST_CHECK_EXCEPTION(ringkv::tensor_view(base, dtype::f32, 1, 4, 4, 16, 2),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, "position_stride"); });
  BOOST_CHECK_EXCEPTION(ringkv::tensor_view(base, dtype::f32, 2, 4, 4, 8, 4), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "head_stride"); });
  BOOST_CHECK_EXCEPTION(ringkv::tensor_view(nullptr, dtype::f32, 1, 4, 4, 16, 4),
                        std::invalid_argument, [](const auto& e) { return mentions(e, "null"); });
  ringkv::tensor_view ok(base, dtype::f32, 1, 4, 4, 16, 4);
  // Heads interleaved within each position ([positions, heads, dim], a prefill chunk's layout).
  const ringkv::tensor_view interleaved(base, dtype::f32, 2, 4, 4, 4, 8);
  BOOST_TEST(interleaved.row<float>(1, 2).data() == data.data() + 2 * 8 + 4);
  BOOST_CHECK_EXCEPTION(ok.slice(3, 2), std::out_of_range, [](const auto& e) {
    return mentions(e, "slice: [3, 5)") && mentions(e, "outside 4 positions");
  });
}

#ifndef NDEBUG
BOOST_AUTO_TEST_CASE(row_access_is_bounds_checked_in_debug_builds) {
  std::vector<float> data(16);
  auto v = ringkv::tensor_view::contiguous(reinterpret_cast<std::byte*>(data.data()), dtype::f32, 2,
                                           2, 4);
  BOOST_CHECK_EXCEPTION(v.row<float>(2, 0), std::out_of_range, [](const auto& e) {
    return mentions(e, "row (head 2, position 0) outside [2, 2)");
  });
  BOOST_CHECK_EXCEPTION(v.row<float>(0, 2), std::out_of_range, [](const auto& e) {
    return mentions(e, "row (head 0, position 2) outside [2, 2)");
  });
  BOOST_CHECK_EXCEPTION(v.row<std::uint16_t>(0, 0), std::invalid_argument, [](const auto& e) {
    return mentions(e, "element type size does not match dtype f32");
  });
}
#endif

BOOST_AUTO_TEST_CASE(a_scope_bumps_aligned_blocks_and_reports_live_bytes_on_reset) {
  trace::recorder r(16);
  ringkv::scope s(4096, r);
  BOOST_TEST(bytes_of_allocations(r) == (std::vector<std::size_t>{4096}),
             boost::test_tools::per_element());
  auto a = s.allocate(10, dtype::f32);            // 40 bytes -> 64 with alignment
  auto b = s.allocate_view(dtype::f16, 2, 3, 5);  // 60 bytes -> 64
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0u);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0u);
  BOOST_TEST(b.data() == a.data() + 64);
  BOOST_TEST(s.live() == 128u);
  s.reset();
  auto resets = r.of<trace::scope_reset>();
  BOOST_REQUIRE(ranges::distance(resets) == 1);
  BOOST_TEST((*ranges::begin(resets)).live_before == 128u);
  BOOST_TEST((*ranges::begin(resets)).live_after == 0u);
  BOOST_TEST(s.allocate(1, dtype::f32).data() == a.data());  // memory is reused after reset
  BOOST_TEST(ranges::distance(r.of<trace::allocation>()) == 1);
}

BOOST_AUTO_TEST_CASE(growing_past_the_slab_is_traced_and_the_next_round_fits_in_one_slab) {
  trace::recorder r(32);
  ringkv::scope s(256, r);
  s.allocate_bytes(200);
  s.allocate_bytes(1000);  // does not fit: a second slab, traced
  BOOST_TEST(bytes_of_allocations(r) == (std::vector<std::size_t>{256, 1024}),
             boost::test_tools::per_element());
  s.reset();  // consolidates into one slab of the high-water mark (256 + 1024)
  r.clear();
  s.allocate_bytes(200);
  s.allocate_bytes(1000);
  s.reset();
  BOOST_TEST(ranges::distance(r.of<trace::allocation>()) == 0);
  BOOST_TEST(s.capacity() == 1280u);
}

BOOST_AUTO_TEST_CASE(a_scope_reset_to_a_size_known_in_advance_takes_it_in_one_traced_slab) {
  trace::recorder r(32);
  ringkv::scope s(256, r);
  s.allocate_bytes(100);
  s.allocate_bytes(500);  // a second slab
  r.clear();
  s.reset(4000);  // one slab for 4,000 bytes, not one for the high-water mark (640) first
  BOOST_TEST(bytes_of_allocations(r) == (std::vector<std::size_t>{4032}),
             boost::test_tools::per_element());
  BOOST_TEST(ranges::distance(r.of<trace::release>()) == 2);  // the 256- and 512-byte slabs
  BOOST_TEST(s.capacity() == 4032u);
  r.clear();
  for (int i = 0; i < 3; ++i) s.allocate_bytes(1000);  // 1024 each with the alignment
  s.allocate_bytes(960);                               // the slab's last 960 bytes
  s.reset(4032);                                       // already held: nothing
  s.reset(10);
  BOOST_TEST(ranges::distance(r.of<trace::allocation>()) == 0);
  BOOST_TEST(s.capacity() == 4032u);
  s.allocate_bytes(5000);  // grown past it
  r.clear();
  s.reset(100);  // the high-water mark (5056) wins over a smaller request
  BOOST_TEST(bytes_of_allocations(r) == (std::vector<std::size_t>{5056}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(zero_sized_scope_requests_are_refused) {
  BOOST_CHECK_EXCEPTION(ringkv::scope(0), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "slab_bytes must be > 0"); });
  ringkv::scope s(64);
  BOOST_CHECK_EXCEPTION(s.allocate_bytes(0), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "bytes must be > 0"); });
  BOOST_CHECK_EXCEPTION(s.allocate_view(dtype::f32, 1, 0, 4), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "positions"); });
  BOOST_TEST(s.live() == 0u);
}

BOOST_AUTO_TEST_CASE(dtype_sizes_and_names) {
  BOOST_TEST(ringkv::size_of(dtype::f32) == 4u);
  BOOST_TEST(ringkv::size_of(dtype::f16) == 2u);
  BOOST_TEST(ringkv::size_of(dtype::bf16) == 2u);
  BOOST_TEST(ringkv::name_of(dtype::bf16) == "bf16");
}
