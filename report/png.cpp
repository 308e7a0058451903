// png.cpp - heatmaps as PNG too: the SVG rendered by librsvg onto a cairo image (when built with librsvg).
#include <filesystem>
#include <string>

#include "attnfuzz/report.h"

#ifdef ATTNFUZZ_HAVE_RSVG
#include <cairo.h>
#include <librsvg/rsvg.h>
#endif

namespace attnfuzz {

bool png_heatmaps_available() {
#ifdef ATTNFUZZ_HAVE_RSVG
  return true;
#else
  return false;
#endif
}

std::string svg_to_png(const std::string& svg, const std::filesystem::path& png) {
#ifdef ATTNFUZZ_HAVE_RSVG
  GError* error = nullptr;
  RsvgHandle* h = rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &error);
  if (!h) {
    std::string why = error ? error->message : "librsvg cannot read the SVG";
    if (error) g_error_free(error);
    return why;
  }
  gdouble w = 0, ht = 0;
  if (!rsvg_handle_get_intrinsic_size_in_pixels(h, &w, &ht) || w < 1 || ht < 1) {
    g_object_unref(h);
    return "the SVG has no size in pixels";
  }
  cairo_surface_t* surface =
      cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(w + 0.5), static_cast<int>(ht + 0.5));
  cairo_t* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);  // an opaque white background: viewers differ on transparent PNGs
  cairo_paint(cr);
  const RsvgRectangle viewport{0, 0, w, ht};
  std::string why;
  if (!rsvg_handle_render_document(h, cr, &viewport, &error)) {
    why = error ? error->message : "librsvg cannot render the SVG";
    if (error) g_error_free(error);
  } else if (cairo_surface_write_to_png(surface, png.c_str()) != CAIRO_STATUS_SUCCESS) {
    why = png.string() + ": cannot write the PNG";
  }
  cairo_destroy(cr);
  cairo_surface_destroy(surface);
  g_object_unref(h);
  return why;
#else
  (void)svg;
  (void)png;
  return "built without librsvg (librsvg2-dev): no PNG heatmaps";
#endif
}

std::string write_heatmap_files(const std::filesystem::path& svg_path, const std::string& svg) {
  write_text_file(svg_path, svg);
  if (!png_heatmaps_available()) return {};
  std::filesystem::path png = svg_path;
  png.replace_extension(".png");
  std::string why = svg_to_png(svg, png);
  return why.empty() ? why : png.string() + ": " + why;
}

}  // namespace attnfuzz
